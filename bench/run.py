"""`make bench`: run every bench/bench_*.py and print their markdown sections, in name order.

Each benchmark is its own process (they set up Django and their databases
differently); pass --quick through for a smoke run.
"""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    failed = 0
    for script in sorted(HERE.glob("bench_*.py")):
        print(f"<!-- {script.name} -->", flush=True)
        failed |= subprocess.call([sys.executable, str(script), *sys.argv[1:]], cwd=HERE.parent)
    return failed


if __name__ == "__main__":
    sys.exit(main())

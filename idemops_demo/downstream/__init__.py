"""Systems idemops talks to, run as their own processes (by `make run` and the tests).

They are real services with their own PostgreSQL databases, so what they did
is a fact a test can check, and they can be told to misbehave.
"""

"""idemops tools as agent frameworks' tools (optional extras).

- `idemops_client.adapters.openai_agents` (`pip install 'idemops-client[openai-agents]'`)
- `idemops_client.adapters.pydantic_ai` (`pip install 'idemops-client[pydantic-ai]'`)

Each turns the server's tools into the framework's tools that call through an
IdempotentClient (keys, ledger, retries), answers in the words of `idemops_client.words`,
and gives instructions that carry the ledger's summary into the agent's context.
"""

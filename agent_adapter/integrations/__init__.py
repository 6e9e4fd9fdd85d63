"""HookBus around agents built with other frameworks.

* ``openai_agents``: the OpenAI Agents SDK (``pip install 'hookbus[openai-agents]'``).
* ``langchain``: LangChain 1.x ``create_agent`` / LangGraph (``pip install 'hookbus[langgraph]'``).
* ``mcp_proxy`` (and ``mcp_http``): ``hookbus mcp``, HookBus in front of any MCP server for any
  MCP client (``pip install 'hookbus[mcp]'``).

Each puts the same ``ToolGate`` (``gate.py``) around each tool call, with any ``EventRunner``:
``HookRegistry`` (hooks in the agent's process) or ``HookClient`` (hook services over Redis).
"""

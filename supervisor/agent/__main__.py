"""``python -m supervisor.agent``: this node's agent (started by the node wrapper)."""

from supervisor.agent.node_agent import main

if __name__ == "__main__":
    main()

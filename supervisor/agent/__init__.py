"""The node agent: the daemon's part on the other nodes of a multi-node attempt
(:mod:`supervisor.agent.node_agent`), and what it and the daemon say to each other
(:mod:`supervisor.agent.wire`). ``python -m supervisor.agent`` runs it."""

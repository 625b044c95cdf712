"""The per-node spawn machinery no training script imports: the rank's bootstrap and waiter, the
zygote (server, child, client, watch, wire), the warm standby, cgroups and node groups.

Standard library only: the supervisor launches these modules, and the zygote loads some of them
by path on the job's interpreter.
"""

"""HookBus on this machine: a private ``redis-server`` (``redis_server``), a local Redis Cluster
(``redis_cluster``), and a whole stack started by ``hookbus up`` (``launcher``)."""

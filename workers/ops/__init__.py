"""What an operator asks and does: hooks, lag, dead letters, tenants, repair (``operator``),
replays (``replay``), health checks (``health``), the ACL users of a deployment (``acl``)."""

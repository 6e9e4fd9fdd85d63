"""The Redis transport: key names (``keys``), connections and batched I/O (``redis_io``), Redis's
clock (``clock``), the hook directory (``directory``), stream retention (``retention``) and the
distributed coordinator that dispatches over them (``coordinator``)."""

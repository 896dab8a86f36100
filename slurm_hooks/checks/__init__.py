"""Built-in checks, one module per family (system, gpu, xid, gpudirect, topology, numa)."""

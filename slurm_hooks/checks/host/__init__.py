"""Family `host`: the node's own hardware beyond the GPUs (memory DIMMs, InfiniBand links, NVMe drives, BMC)."""

"""Everything that touches storage: object stores (local and S3), input discovery and
streaming, the plan and shard stores, leases, the output directory."""

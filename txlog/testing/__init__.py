"""Support for tests, benchmarks and third-party stores: the store contract suite, real test
servers (SeaweedFS, fake-gcs-server, Azurite), a fault-injecting store, the torture harness
and its checker, and instruments that run against real stores (a latency
proxy for an S3 endpoint, a store wrapper that records every request's timeline)."""

"""Support for tests and benchmarks: instruments that run against real stores (a latency
proxy for an S3 endpoint, a store wrapper that records every request's timeline)."""

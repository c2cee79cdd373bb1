"""The sidecar: scrape one engine, report it to the store under a lease."""

"""GCP: the Compute Engine fake (``fake``); stand-ins, the metadata server and the pool
helpers (``standins``)."""

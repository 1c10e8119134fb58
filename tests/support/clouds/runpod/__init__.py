"""RunPod: the fake of its GraphQL and REST (v1) APIs (``fake``); stand-in pods (``standins``)."""

"""Azure: the fake ARM server (``fake``), stand-ins (``standins``), pool helpers (``pools``)."""

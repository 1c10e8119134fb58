"""AWS: moto (``fake``), the EC2 proxy (``proxy``), stand-ins (``standins``), pool helpers
(``pools``)."""

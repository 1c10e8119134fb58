"""Lambda Cloud test support: a fake of its REST API, stand-in VMs."""

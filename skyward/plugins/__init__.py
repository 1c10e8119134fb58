"""Built-in plugins. Each is a function returning a ``sky.Plugin``."""

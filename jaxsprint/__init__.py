"""jaxsprint."""

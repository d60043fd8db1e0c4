"""fastps plugin (being built)."""

"""``kvgate status``: a running gateway's nodes, tenants and decisions in the terminal."""

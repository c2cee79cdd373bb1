"""The HTTP gateway (``kvgate serve``): auth → admission → router → proxy."""

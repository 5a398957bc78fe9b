"""Where runners run: the driver protocol, local processes (and the zygote), Helm."""

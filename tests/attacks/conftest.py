from .live import attack_repo  # noqa: F401

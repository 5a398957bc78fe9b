from tests.attacks.live import attack_repo  # noqa: F401

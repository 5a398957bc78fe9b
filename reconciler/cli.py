def main() -> None:
    print("plnt")

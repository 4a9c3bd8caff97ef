"""`python -m trainer ...` is `ddp-train ...`."""

from trainer.cli import main

if __name__ == "__main__":
    main()

"""``python -m lit_rl.cli ...`` is the ``lit-rl`` command."""

from lit_rl.cli import console_main

if __name__ == "__main__":
    console_main()

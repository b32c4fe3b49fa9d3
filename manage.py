"""``python manage.py ...`` is the same as the ``rlreg`` command."""
from registry.cli.main import main

if __name__ == "__main__":
    main()

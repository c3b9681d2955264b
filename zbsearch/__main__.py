"""`python -m zbsearch ...` is `zbsearch ...`: what launchers that start a module (torchrun -m, srun python
-m) need."""

from .cli import main

if __name__ == "__main__":
    main()

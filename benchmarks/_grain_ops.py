"""grain's DataLoader takes its operations as ``grain.transforms.Map`` instances (imported only
where grain is wanted)."""
import grain


class FuncMap(grain.transforms.Map):
    """``func`` as a grain Map transform (picklable by reference: ``func`` is module-level)."""

    def __init__(self, func):
        self.func = func

    def map(self, element):
        return self.func(element)

"""The map-style torch Dataset of the reference workloads (imported only where torch is wanted)."""
import torch.utils.data


class MapStyleDataset(torch.utils.data.Dataset):
    """``length`` items: item i is ``func(source[i % len(source)])``.

    A length of several passes lets one DataLoader epoch cover a run that needs more than 10000
    datapoints, so torch pays no worker restart between passes.
    """

    def __init__(self, source, func, length):
        self.source = source
        self.func = func
        self.length = length

    def __len__(self):
        return self.length

    def __getitem__(self, i):
        return self.func(self.source[i % len(self.source)])

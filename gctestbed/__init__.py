"""gctestbed: does gradient compression speed up training on this network, and below which bandwidth?"""

__version__ = "0.1.0"

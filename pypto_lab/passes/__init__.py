"""Graph passes (op mapping, fusion, layout, precision, tiling, scheduling, memory planning).

Populated by the whole-model work; the hardware model they drive is `pypto_lab.hw`.
"""

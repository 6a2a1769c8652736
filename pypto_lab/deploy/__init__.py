"""Deploying: ONNX in (`onnx_import`), ATC's command (`atc`), the OM artefact out (`om`)."""

from .om import OMError, OMModel, load_om, save_om

__all__ = ["OMError", "OMModel", "load_om", "save_om"]

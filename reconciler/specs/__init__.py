"""The resources as data: spec models, the loader that checks a commit's files, the CRDs."""

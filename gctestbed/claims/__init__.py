"""The field's claims about gradient compression, rerun on this machine with verdicts.

``catalog`` holds every claim as data (source, sentence, parts); ``experiments`` the sweeps they
are measured on, at a quick and a full scale; ``figures`` what is computed from the store;
``verdict`` the rule from measurement to agree, disagree or inconclusive; ``judge`` runs and
judges; ``page`` draws the report.
"""

"""Prefect flows (ingest, cluster, study, schedules).

Built on pipeline and vbcore; this layer alone imports prefect.
"""

"""The web dashboard's static files, served by the job endpoint at ``/dashboard/``."""

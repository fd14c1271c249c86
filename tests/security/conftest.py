"""The security tests play an attacker (issue 24): against a server process here, and against the local
cluster with a second namespace as the victim."""

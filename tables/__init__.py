"""Feature state: the feature spec and its pure update code, and the Faust table that holds it."""

#!/bin/sh
# Runs once, on the first start of an empty PostgreSQL volume (postgres image entrypoint):
# creates the Optuna RDB storage database next to MLflow's, owned by the same user.
set -eu
psql -v ON_ERROR_STOP=1 --username "$POSTGRES_USER" --dbname postgres \
    -c "CREATE DATABASE \"${OPTUNA_DB:-optuna}\" OWNER \"$POSTGRES_USER\""

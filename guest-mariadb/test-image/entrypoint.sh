#!/bin/sh
# The test image's entrypoint: what the official mariadb image's docker-entrypoint.sh does
# with the variables the MariaDB plugin sets, and nothing else. On an empty data directory:
# mariadb-install-db, then on a server without networking (and without the binlog: the
# accounts are each server's own, never replicated) the root password and hosts
# (MARIADB_ROOT_PASSWORD, MARIADB_ROOT_HOST) and the replication account
# (MARIADB_REPLICATION_USER, MARIADB_REPLICATION_PASSWORD), then the .sql files in
# /docker-entrypoint-initdb.d. Then it runs the server.
#
# Started as root (the image's user, as the official image's entrypoint starts), it gives the
# data directory to `nonroot` and the servers switch to that user themselves (`--user`): a
# volume's directory may be root's and not writable by others (the in-tree hostPath
# provisioner's are 0750), and fsGroup does not apply to every volume type. Started as
# another user (a Pod's runAsUser), it runs as that user.
set -eu

if [ "${1#-}" != "$1" ]; then
	set -- mariadbd "$@"
fi
if [ "$1" != mariadbd ]; then
	exec "$@"
fi

datadir=/var/lib/mysql
as_user=
if [ "$(id -u)" = 0 ]; then
	chown -R 65532:65532 "$datadir"
	as_user=--user=nonroot
	set -- "$@" "$as_user"
fi
if [ ! -d "$datadir/mysql" ]; then
	: "${MARIADB_ROOT_PASSWORD:?set MARIADB_ROOT_PASSWORD (the official image refuses to start without a root password too)}"
	# --rpm: no hostname lookup (a Pod's may not resolve yet), as the official image does.
	mariadb-install-db --rpm --datadir="$datadir" --auth-root-authentication-method=normal \
		--skip-test-db --skip-name-resolve --skip-log-bin ${as_user} >/dev/null
	socket=/tmp/init.sock
	mariadbd --skip-networking --skip-log-bin --socket="$socket" --datadir="$datadir" ${as_user} &
	pid=$!
	tries=0
	until mariadb --protocol=socket --socket="$socket" -uroot -e 'SELECT 1' >/dev/null 2>&1; do
		tries=$((tries + 1))
		if [ "$tries" -gt 300 ]; then
			echo "entrypoint: the initialising server did not answer in 60 s" >&2
			exit 1
		fi
		sleep 0.2
	done
	root_host=${MARIADB_ROOT_HOST:-%}
	{
		echo "SET @@SESSION.SQL_LOG_BIN=0;"
		# As the official image: only root@localhost stays of what install-db made (its
		# password-less root@127.0.0.1, @::1 and @<hostname> would match before root@%).
		echo "DELETE FROM mysql.global_priv WHERE User NOT IN ('mariadb.sys', 'root') OR (User = 'root' AND Host <> 'localhost');"
		echo "FLUSH PRIVILEGES;"
		echo "ALTER USER 'root'@'localhost' IDENTIFIED BY '$MARIADB_ROOT_PASSWORD';"
		if [ "$root_host" != localhost ]; then
			echo "CREATE USER 'root'@'$root_host' IDENTIFIED BY '$MARIADB_ROOT_PASSWORD';"
			echo "GRANT ALL ON *.* TO 'root'@'$root_host' WITH GRANT OPTION;"
		fi
		if [ -n "${MARIADB_REPLICATION_USER:-}" ]; then
			echo "CREATE USER '$MARIADB_REPLICATION_USER'@'%' IDENTIFIED BY '${MARIADB_REPLICATION_PASSWORD:-}';"
			echo "GRANT REPLICATION REPLICA ON *.* TO '$MARIADB_REPLICATION_USER'@'%';"
		fi
	} | mariadb --protocol=socket --socket="$socket" -uroot
	# As the official image: the .sql files of /docker-entrypoint-initdb.d, in order (the
	# plugin's seed step writes a copy of the primary there).
	for file in /docker-entrypoint-initdb.d/*.sql; do
		[ -e "$file" ] || continue
		echo "entrypoint: loading $file" >&2
		MYSQL_PWD=$MARIADB_ROOT_PASSWORD mariadb --protocol=socket --socket="$socket" -uroot <"$file"
	done
	kill "$pid"
	wait "$pid" || true
fi
exec "$@"

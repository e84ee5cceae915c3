//! Names and JSON of what the plugin creates: one Pod and one claim per server, the server
//! configuration (a ConfigMap), the Services `<name>-primary`, `<name>-replicas` and
//! `<name>-headless`, a PodDisruptionBudget, and with backups the claim `<name>-backups` and
//! the Pod `<name>-backup` that takes one.

use policy_host_sdk::children::{
    Container, Pod, child_object, claim, config_map_kind, disruption_budget, headless_service,
    service,
};
pub use policy_host_sdk::children::{pdb_kind, pod_kind, pvc_kind, service_kind};
use policy_host_sdk::names::ChildName;
use serde_json::{Value, json};

use crate::spec::{DEFAULT_MC_IMAGE, MariaDBClusterSpec, Restore, S3Object, S3Target};

/// MariaDB's port.
pub const MYSQL_PORT: u16 = 3306;

/// The container port name the plugin holds sessions with (the admin grants it).
pub const MYSQL_PORT_NAME: &str = "mysql";

/// The account replicas replicate with (the image's entrypoint creates it on every server
/// from `MARIADB_REPLICATION_USER`, outside the binlog).
pub const REPLICATION_USER: &str = "repl";

/// Label naming the resource a Pod belongs to.
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";

/// Label the plugin sets on every server: `primary`, `replica`, or `errant` (quarantined: in
/// neither Service). The Services select on it, so they follow a failover once it moves.
pub const ROLE_LABEL: &str = "mariadb.policy-host.io/role";

/// The annotation on the MariaDBCluster asking for a switchover: its value names the server
/// to promote (`<name>-2`), optionally followed by `@<anything>` to ask again for a server
/// already promoted once.
pub const SWITCHOVER_ANNOTATION: &str = "mariadb.policy-host.io/switchover-to";

/// Every name and label value derived from the parent's name, with the largest ordinal
/// (`spec.replicas` is at most 8): a parent whose name makes one invalid is refused before
/// anything is applied.
pub const CHILD_NAMES: &[ChildName] = &[
    ChildName::service("{name}-primary"),
    ChildName::service("{name}-replicas"),
    ChildName::service("{name}-headless"),
    // The Pod name is also its hostname: a DNS label.
    ChildName::dns_label("Pod", "{name}-8"),
    ChildName::object("PersistentVolumeClaim", "data-{name}-8"),
    ChildName::object("ConfigMap", "{name}-config"),
    ChildName::object("Pod", "{name}-backup"),
    ChildName::object("PersistentVolumeClaim", "{name}-backups"),
    ChildName::label_value(INSTANCE_LABEL, "{name}"),
];

/// The largest ordinal a server gets (`spec.replicas` is at most 8).
pub const MAX_ORDINAL: u32 = 8;

/// The Pod name of server `ordinal`.
pub fn pod_name(parent: &str, ordinal: u32) -> String {
    format!("{parent}-{ordinal}")
}

/// The ordinal of a server Pod of `parent`, if `pod` is one.
pub fn ordinal(parent: &str, pod: &str) -> Option<u32> {
    pod.strip_prefix(parent)?.strip_prefix('-')?.parse().ok()
}

/// The headless Service, which gives each server a stable DNS name.
pub fn headless_name(parent: &str) -> String {
    format!("{parent}-headless")
}

/// The name replicas reach `pod` by: `<pod>.<parent>-headless`.
pub fn host_of(parent: &str, pod: &str) -> String {
    format!("{pod}.{}", headless_name(parent))
}

/// The claim holding server `pod`'s data.
pub fn claim_name(pod: &str) -> String {
    format!("data-{pod}")
}

fn config_name(parent: &str) -> String {
    format!("{parent}-config")
}

/// What every server runs with, whatever its role. Every server starts read-only and does not
/// start replicating by itself (MOCO boots `super_read_only` and `skip_replica_start`): only
/// the plugin makes a server writable or points it at a source, after checking GTIDs, so a
/// server that restarts can never take writes beside another primary.
///
/// Semi-synchronous replication waits after the binlog sync (`AFTER_SYNC`), so a write is
/// acknowledged only once a replica has it; its timeout is the largest MariaDB takes, so it
/// never falls back to asynchronous silently. The primary turns it on only with replicas.
pub const SERVER_CONFIG: &str = "\
[mariadb]
log_bin = mariadb-bin
log_slave_updates = ON
binlog_format = ROW
gtid_strict_mode = ON
gtid_domain_id = 0
read_only = ON
skip_slave_start
relay_log = relay-bin
relay_log_recovery = ON
sync_binlog = 1
innodb_flush_log_at_trx_commit = 1
rpl_semi_sync_slave_enabled = ON
rpl_semi_sync_master_wait_point = AFTER_SYNC
rpl_semi_sync_master_timeout = 4294967295
skip_name_resolve = ON
";

/// The annotation on a server Pod naming the configuration it started with
/// ([`config_revision`]): a Pod whose revision is not the spec's is restarted by the rolling
/// update.
pub const CONFIG_REVISION_ANNOTATION: &str = "mariadb.policy-host.io/config-revision";

/// What every server reads: [`SERVER_CONFIG`], then `spec.config`'s options (validated by
/// [`MariaDBClusterSpec::invalid`]), in key order.
pub fn config_text(spec: &MariaDBClusterSpec) -> String {
    let mut text = SERVER_CONFIG.to_owned();
    for (key, value) in &spec.config {
        text.push_str(key);
        if !value.is_empty() {
            text.push_str(" = ");
            text.push_str(value);
        }
        text.push('\n');
    }
    text
}

/// A short digest of [`config_text`] (FNV-1a, 64 bits, hex): equal texts, equal revisions, on
/// every architecture and in every run, so a decision stays a function of the observation.
pub fn config_revision(spec: &MariaDBClusterSpec) -> String {
    let digest = config_text(spec)
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        });
    format!("{digest:016x}")
}

/// The revision of the plugin's own configuration, without options of the spec's.
pub fn base_config_revision() -> String {
    config_revision(&MariaDBClusterSpec::default())
}

/// The ConfigMap holding [`config_text`], mounted into every server's `conf.d`. A server reads
/// it when it starts: one restarted for another reason before the rolling update reaches it
/// starts with the new options early.
pub fn server_config(parent: &str, spec: &MariaDBClusterSpec) -> Value {
    child_object(
        &config_map_kind(),
        &config_name(parent),
        &[(INSTANCE_LABEL, parent)],
        json!({ "data": { "policy-host.cnf": config_text(spec) } }),
    )
}

/// A server's role label value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Takes writes; behind `<name>-primary`.
    Primary,
    /// Replicates from the primary; behind `<name>-replicas`.
    Replica,
    /// Holds transactions the primary lacks; in no Service.
    Errant,
}

impl Role {
    /// The label value.
    pub fn label(self) -> &'static str {
        match self {
            Role::Primary => "primary",
            Role::Replica => "replica",
            Role::Errant => "errant",
        }
    }
}

/// The annotation on a server Pod created with the seed step ([`SEED_SCRIPT`]), naming the
/// donor it copies from when its data directory is empty. A Pod created before the plugin
/// seeded lacks it and is rebuilt as it was: a Pod's containers cannot change.
pub const SEED_ANNOTATION: &str = "mariadb.policy-host.io/seed-from";

/// The donor a new server copies from: the primary, through its Service (a stable name, so
/// the Pod's spec never changes with a failover).
pub fn donor(parent: &str) -> String {
    format!("{parent}-primary")
}

/// How a server's seed step fills an empty data directory: from the donor, or, for the first
/// server of a cluster restored from a backup while no donor answers, from that backup.
#[derive(Clone, Debug, PartialEq)]
pub struct Seed {
    /// The donor: the primary's Service ([`donor`]).
    pub donor: String,
    /// Whether a primary was there when the server was created ([`SEED_REQUIRED_ANNOTATION`]):
    /// then it waits for the donor rather than start empty, since the primary's data may be in
    /// no binlog (a restored cluster's, or purged).
    pub required: bool,
    /// The backup ([`RESTORE_ANNOTATION`]).
    pub restore: Option<RestoreSource>,
}

/// Where a restored server's backup is.
#[derive(Clone, Debug, PartialEq)]
pub enum RestoreSource {
    /// A file on a claim of the namespace.
    Claim {
        /// The claim.
        claim: String,
        /// The file on it.
        file: String,
    },
    /// An object in an S3-compatible store.
    S3(S3Object),
}

impl RestoreSource {
    /// The source `spec.restore` names.
    pub fn of(restore: &Restore) -> Option<RestoreSource> {
        match (&restore.claim, &restore.file, &restore.s3) {
            (_, _, Some(s3)) => Some(RestoreSource::S3(s3.clone())),
            (Some(claim), Some(file), None) => Some(RestoreSource::Claim {
                claim: claim.clone(),
                file: file.clone(),
            }),
            _ => None,
        }
    }

    /// The Pod's [`RESTORE_ANNOTATION`]: `<claim>/<file>`, or `s3:` and the object as JSON
    /// (the Pod is rebuilt from it as it was created, whatever the spec says later).
    pub fn annotation(&self) -> String {
        match self {
            RestoreSource::Claim { claim, file } => format!("{claim}/{file}"),
            RestoreSource::S3(object) => {
                format!("s3:{}", serde_json::to_string(object).unwrap_or_default())
            }
        }
    }

    /// Reads [`RestoreSource::annotation`] back.
    pub fn parse(text: &str) -> Option<RestoreSource> {
        if let Some(object) = text.strip_prefix("s3:") {
            return serde_json::from_str(object).ok().map(RestoreSource::S3);
        }
        let (claim, file) = text.split_once('/')?;
        Some(RestoreSource::Claim {
            claim: claim.to_owned(),
            file: file.to_owned(),
        })
    }

    /// What `status.restoredFrom` says: `<claim>/<file>` or `s3://<bucket>/<key>`.
    pub fn describe(&self) -> String {
        match self {
            RestoreSource::Claim { claim, file } => format!("{claim}/{file}"),
            RestoreSource::S3(object) => format!("s3://{}/{}", object.bucket, object.key),
        }
    }

    /// The file name the seed step reads under [`RESTORE_MOUNT`].
    fn file(&self) -> &str {
        match self {
            RestoreSource::Claim { file, .. } => file,
            RestoreSource::S3(object) => object.key.rsplit('/').next().unwrap_or(&object.key),
        }
    }
}

/// The annotation on a server Pod created beside a primary, whose seed step waits for the
/// donor ([`Seed::required`]).
pub const SEED_REQUIRED_ANNOTATION: &str = "mariadb.policy-host.io/seed-required";

/// The annotation on a server Pod created to restore a backup ([`RestoreSource::annotation`]).
pub const RESTORE_ANNOTATION: &str = "mariadb.policy-host.io/restore-from";

/// The `mc` alias of a store, as in `s3/<bucket>/<object>`.
const MC_ALIAS: &str = "s3";

/// The environment that gives `mc` the alias `s3` for `endpoint` with the keys of `secret`
/// (`accessKeyID`, `secretAccessKey`), composed by Kubernetes' `$(VAR)` expansion, so the Pod
/// spec never holds them and no shell is needed (the `mc` image has none).
fn mc_env(endpoint: &str, secret: &str) -> Value {
    // Validation guarantees a scheme.
    let (scheme, host) = endpoint
        .trim()
        .trim_end_matches('/')
        .split_once("://")
        .unwrap_or(("https", endpoint));
    let key = |name: &str, key: &str| json!({"name": name, "valueFrom": {"secretKeyRef": {"name": secret, "key": key}}});
    json!([
        key("S3_ACCESS_KEY_ID", "accessKeyID"),
        key("S3_SECRET_ACCESS_KEY", "secretAccessKey"),
        {"name": format!("MC_HOST_{MC_ALIAS}"),
         "value": format!("{scheme}://$(S3_ACCESS_KEY_ID):$(S3_SECRET_ACCESS_KEY)@{host}")},
    ])
}

/// Where the seed step finds the backup claim.
const RESTORE_MOUNT: &str = "/restore";

/// The seed step, an init container on the server's image: on an empty data directory it dumps
/// every database of the donor (`mariadb-dump --single-transaction --gtid`, one consistent
/// snapshot and the GTID it ends at) into the directory the image's entrypoint loads when it
/// initialises (`/docker-entrypoint-initdb.d`, as the official image does), with the binlog off
/// for the load and `gtid_slave_pos` set to that GTID, so the server replicates on from there
/// — also when the primary has purged older binlogs. No donor answering (a new cluster has no
/// primary yet) is no seed: the server starts empty and replicates from the beginning; but a
/// server created beside a primary ([`Seed::required`]) waits for it, since the primary's
/// data may be in no binlog (a restored cluster's). A donor that answers but whose dump fails
/// fails the step, and the kubelet runs it again.
pub const SEED_SCRIPT: &str = r#"set -eu
seed=/docker-entrypoint-initdb.d
rm -f "$seed"/*.sql "$seed"/dump.*
if [ -d /var/lib/mysql/mysql ]; then
  exit 0
fi
donor_answers() {
  mariadb --connect-timeout=5 -h "$DONOR" -u root -e "SELECT 1" >/dev/null 2>"$seed/dump.err"
}
if ! donor_answers; then
  if [ -n "${DONOR_REQUIRED:-}" ]; then
    # Created beside a primary, whose data may be in no binlog (restored from a backup, or
    # purged): it is copied, never skipped. The Service may lag the primary's label for a
    # moment; past a minute the step fails and the kubelet runs it again.
    tries=1
    until donor_answers; do
      if [ "$tries" -ge 30 ]; then
        echo "seed: the primary does not answer at $DONOR ($(head -c 300 "$seed/dump.err")); this server copies it before it starts" >&2
        exit 1
      fi
      tries=$((tries + 1))
      sleep 2
    done
  elif [ -n "${RESTORE_FILE:-}" ]; then
    # The first server of a restored cluster: the backup, loaded without the binlog (the
    # other servers copy this one once it is the primary).
    if [ ! -f "$RESTORE_FILE" ]; then
      echo "seed: the backup $RESTORE_FILE is not on the claim; fix spec.restore" >&2
      exit 1
    fi
    { echo "SET SESSION sql_log_bin = 0;"; cat "$RESTORE_FILE"; } >"$seed/seed.sql"
    rm -f "$seed"/dump.*
    echo "seed: restoring $RESTORE_FILE" >&2
    exit 0
  else
    echo "seed: no donor answers at $DONOR ($(head -c 300 "$seed/dump.err")): starting empty" >&2
    rm -f "$seed"/dump.*
    exit 0
  fi
fi
# A donor that answers but whose dump fails fails the Pod's start (the kubelet runs this
# again): starting empty would replay a binlog the primary may have purged.
mariadb-dump -h "$DONOR" -u root --all-databases --single-transaction --gtid --master-data=2 \
  --routines --events --triggers --flush-privileges >"$seed/dump.sql.part"
# With the binary log on, the dump names its binlog position; its GTID position is absent
# when the donor's binlog holds no transaction yet (a primary just restored from a backup).
if [ -z "$(sed -n "/^-- CHANGE MASTER TO MASTER_LOG_FILE=/p" "$seed/dump.sql.part" | head -n 1)" ]; then
  echo "seed: the dump from $DONOR names no binlog position (is its binary log on?)" >&2
  exit 1
fi
pos=$(sed -n "s/^-- SET GLOBAL gtid_slave_pos='\([^']*\)';.*/\1/p" "$seed/dump.sql.part" | head -n 1)
{
  echo "SET SESSION sql_log_bin = 0;"
  cat "$seed/dump.sql.part"
  echo "SET GLOBAL gtid_slave_pos = '$pos';"
} >"$seed/seed.sql"
rm -f "$seed"/dump.*
echo "seed: copied from $DONOR at GTID $pos" >&2
"#;

/// The directory the image's entrypoint loads `.sql` files from on an empty data directory.
const INIT_FILES: &str = "/docker-entrypoint-initdb.d";

/// A server Pod: `image` and `config_revision` are the ones it was created with (a change of
/// either is a restart, by the rolling update), and so is `seed` (the seed step's donor,
/// [`SEED_ANNOTATION`], and backup, [`RESTORE_ANNOTATION`]); the role label is the only field
/// that moves.
pub fn server_pod(
    parent: &str,
    pod: &str,
    image: &str,
    config_revision: &str,
    seed: Option<&Seed>,
    role: Role,
    spec: &MariaDBClusterSpec,
) -> Value {
    // server_id must differ between servers (GTIDs carry it) and may not be 0 on a replica.
    let server_id = ordinal(parent, pod).map_or(1, |o| o + 1);
    let secret = &spec.secret(parent);
    let mut container = Container::new("mariadb", image)
        .args([
            format!("--server-id={server_id}"),
            format!("--report-host={}", host_of(parent, pod)),
        ])
        .port(MYSQL_PORT_NAME, MYSQL_PORT)
        .env_from_secret("MARIADB_ROOT_PASSWORD", secret, "root-password")
        .env("MARIADB_ROOT_HOST", "%")
        .env("MARIADB_REPLICATION_USER", REPLICATION_USER)
        .env_from_secret(
            "MARIADB_REPLICATION_PASSWORD",
            secret,
            "replication-password",
        )
        .mount("data", "/var/lib/mysql")
        .mount("config", "/etc/mysql/conf.d")
        .ready_on_tcp(MYSQL_PORT_NAME);
    if seed.is_some() {
        container = container.mount("seed", INIT_FILES);
    }
    if let Some(resources) = &spec.resources {
        container = container.field(
            "resources",
            serde_json::to_value(resources).unwrap_or_default(),
        );
    }
    let mut built = Pod::new(pod)
        .label(INSTANCE_LABEL, parent)
        .label(ROLE_LABEL, role.label())
        .annotation(CONFIG_REVISION_ANNOTATION, config_revision)
        .stable_dns(&headless_name(parent))
        .claim_volume("data", &claim_name(pod))
        .container(container)
        .spec_field("terminationGracePeriodSeconds", json!(30));
    let mut restore_volume = None;
    if let Some(seed) = seed {
        // The root password reaches mariadb-dump through its environment (MYSQL_PWD), never
        // its command line.
        let mut step = Container::new("seed", image)
            .field("command", json!(["sh", "-c", SEED_SCRIPT]))
            .env("DONOR", &seed.donor)
            .env_from_secret("MYSQL_PWD", secret, "root-password")
            .mount("data", "/var/lib/mysql")
            .mount("seed", INIT_FILES);
        built = built.annotation(SEED_ANNOTATION, &seed.donor);
        if seed.required {
            step = step.env("DONOR_REQUIRED", "1");
            built = built.annotation(SEED_REQUIRED_ANNOTATION, "true");
        }
        let mut init = Vec::new();
        if let Some(source) = &seed.restore {
            step = step
                .env(
                    "RESTORE_FILE",
                    &format!("{RESTORE_MOUNT}/{}", source.file()),
                )
                .mount("restore", RESTORE_MOUNT);
            built = built.annotation(RESTORE_ANNOTATION, &source.annotation());
            match source {
                RestoreSource::Claim { claim, .. } => {
                    // The backup claim, read-only.
                    restore_volume = Some(json!({
                        "name": "restore",
                        "persistentVolumeClaim": { "claimName": claim, "readOnly": true }
                    }));
                }
                RestoreSource::S3(object) => {
                    // Scratch space the download fills before the seed step reads it.
                    restore_volume = Some(json!({ "name": "restore", "emptyDir": {} }));
                    init.push(download_container(object));
                }
            }
        }
        init.push(step.build());
        built = built
            .empty_dir_volume("seed")
            .spec_field("initContainers", Value::Array(init));
    }
    let mut built = built.build();
    // The ConfigMap volume, and the backup's: not among the SDK's builders.
    if let Some(volumes) = built["spec"]["volumes"].as_array_mut() {
        volumes.push(json!({ "name": "config", "configMap": { "name": config_name(parent) } }));
        volumes.extend(restore_volume);
    }
    built
}

/// The init container that copies a backup object into the restore volume, before the seed
/// step loads it.
fn download_container(object: &S3Object) -> Value {
    let file = object.key.rsplit('/').next().unwrap_or(&object.key);
    json!({
        "name": "download",
        "image": object.image.as_deref().unwrap_or(DEFAULT_MC_IMAGE),
        "command": [
            "mc", "--config-dir", format!("{RESTORE_MOUNT}/.mc"), "cp",
            format!("{MC_ALIAS}/{}/{}", object.bucket, object.key),
            format!("{RESTORE_MOUNT}/{file}"),
        ],
        "env": mc_env(&object.endpoint, &object.credentials_secret),
        "volumeMounts": [{"name": "restore", "mountPath": RESTORE_MOUNT}],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    })
}

/// The object a backup `file` of the cluster in `namespace` is uploaded to:
/// `<prefix><namespace>/<file>` (a cluster's name is unique only within its namespace).
pub fn object_name(s3: &S3Target, namespace: &str, file: &str) -> String {
    format!("{}{namespace}/{file}", s3.prefix())
}

/// The container that uploads a proven backup (`mc cp`), after the backup step.
pub const UPLOAD_CONTAINER: &str = "upload";

/// The claim backups are kept on.
pub fn backups_claim_name(parent: &str) -> String {
    format!("{parent}-backups")
}

/// The Pod taking a backup (one at a time).
pub fn backup_pod_name(parent: &str) -> String {
    format!("{parent}-backup")
}

/// The container of the backup Pod, whose termination message is the result.
pub const BACKUP_CONTAINER: &str = "backup";

/// The annotation on the backup Pod saying what it is for: `trigger:<value>` or
/// `scheduled:<due time>`.
pub const BACKUP_REASON_ANNOTATION: &str = "mariadb.policy-host.io/backup-for";

/// The annotation on the backup Pod saying when it was created (RFC 3339): its file's time,
/// and the start of its deadline.
pub const BACKUP_STARTED_ANNOTATION: &str = "mariadb.policy-host.io/backup-started";

/// The backup claim.
pub fn backups_claim(parent: &str, spec: &MariaDBClusterSpec) -> Option<Value> {
    let backup = spec.backup.as_ref()?;
    let mut built = claim(
        &backups_claim_name(parent),
        &backup.storage.size,
        backup.storage.storage_class_name.as_deref(),
    );
    built["metadata"]["labels"] = json!({ INSTANCE_LABEL: parent });
    Some(built)
}

/// The backup step, on the servers' image: dumps every database but MariaDB's own from the
/// primary (one consistent snapshot, `--single-transaction`, with the GTID it ends at) and the
/// applications' accounts and roles with their grants (not root, the replication account or
/// MariaDB's own), loads the dump into a throwaway server in the Pod to prove it restores (a
/// failed load fails the backup) and counts what it holds, then moves it into place on the
/// claim and removes the oldest beyond `KEEP`. Its result, or why it failed, is its
/// termination message: `file=… gtid=… bytes=… tables=… rows=… accounts=…`.
pub const BACKUP_SCRIPT: &str = r#"set -u
fail() {
  echo "backup: $1" >&2
  printf 'failed: %s' "$1" | head -c 3000 >/dev/termination-log
  exit 1
}
dir=/backups
part="$dir/.$FILE.part"
system="'mysql','information_schema','performance_schema','sys'"
dbs=$(mariadb --connect-timeout=10 -h "$SOURCE" -u root -N -B \
  -e "SELECT schema_name FROM information_schema.schemata WHERE schema_name NOT IN ($system)" 2>/tmp/err) \
  || fail "cannot ask $SOURCE which databases it holds: $(head -c 500 /tmp/err)"
if [ -n "$dbs" ]; then
  # One word per database (names of letters, digits, `_` and `$`, as MariaDB allows unquoted).
  # shellcheck disable=SC2086
  mariadb-dump -h "$SOURCE" -u root --single-transaction --gtid --master-data=2 \
    --routines --events --triggers --databases $dbs >"$part" 2>/tmp/err \
    || fail "mariadb-dump from $SOURCE failed: $(head -c 500 /tmp/err)"
  gtid=$(sed -n "s/^-- SET GLOBAL gtid_slave_pos='\([^']*\)';.*/\1/p" "$part" | head -n 1)
else
  gtid=$(mariadb -h "$SOURCE" -u root -N -B -e "SELECT @@gtid_binlog_pos" 2>/tmp/err) \
    || fail "cannot ask $SOURCE its position: $(head -c 500 /tmp/err)"
  echo "-- no database besides MariaDB's own on $SOURCE" >"$part"
fi
# The applications' accounts and roles with their grants, so that a restored cluster lets its
# clients in. Not the cluster's own (root, the replication account) nor MariaDB's: a cluster has
# those from its own Secret and its own initialisation. Every account is created first, then
# every grant given (a grant may name a role listed after it).
own="'root','$REPL_USER','mariadb.sys','mysql','PUBLIC',''"
accounts=$(mariadb --connect-timeout=10 -h "$SOURCE" -u root -N -B -r \
  -e "SELECT is_role, QUOTE(user), QUOTE(host) FROM mysql.user WHERE user NOT IN ($own) ORDER BY is_role DESC, user, host" \
  2>/tmp/err) || fail "cannot ask $SOURCE which accounts it holds: $(head -c 500 /tmp/err)"
tab=$(printf '\t')
ask() {
  mariadb -h "$SOURCE" -u root -N -B -r -e "$1" >/tmp/account
}
copy_accounts() {
  echo "-- The applications' accounts and roles, then their grants"
  printf '%s\n' "$accounts" | while IFS="$tab" read -r role user host; do
    if [ "$role" = Y ]; then
      echo "CREATE ROLE IF NOT EXISTS $user;"
    else
      ask "SHOW CREATE USER $user@$host" || exit 1
      sed 's/^CREATE USER /CREATE USER IF NOT EXISTS /; s/$/;/' /tmp/account
    fi
  done || return 1
  printf '%s\n' "$accounts" | while IFS="$tab" read -r role user host; do
    if [ "$role" = Y ]; then
      ask "SHOW GRANTS FOR $user" || exit 1
    else
      ask "SHOW GRANTS FOR $user@$host" || exit 1
    fi
    sed 's/$/;/' /tmp/account
  done
}
if [ -n "$accounts" ]; then
  copy_accounts >>"$part" 2>/tmp/err \
    || fail "cannot copy the accounts of $SOURCE: $(head -c 500 /tmp/err)"
fi
# The proof: a throwaway server on a scratch directory loads the dump.
verify=/tmp/verify
as_user=
if [ "$(id -u)" = 0 ]; then
  as_user=--user=root
fi
mariadb-install-db --datadir="$verify" $as_user --skip-test-db --skip-name-resolve --skip-log-bin \
  >/tmp/err 2>&1 \
  || fail "cannot initialise the server that proves the backup: $(tail -c 500 /tmp/err)"
sock=/tmp/verify.sock
# With its grant tables (root logs in over the socket as the Pod's root user): the accounts and
# roles are created, and roles granted, as a restore's root does them.
mariadbd --datadir="$verify" --socket="$sock" --skip-networking --skip-log-bin \
  $as_user >/tmp/verify.log 2>&1 &
server=$!
tries=0
until mariadb --socket="$sock" -u root -e "SELECT 1" >/dev/null 2>&1; do
  tries=$((tries + 1))
  [ "$tries" -le 300 ] || fail "the server that proves the backup did not start: $(tail -c 500 /tmp/verify.log)"
  sleep 0.2
done
mariadb --socket="$sock" -u root <"$part" 2>/tmp/err \
  || fail "the dump does not load into a fresh server: $(head -c 500 /tmp/err)"
tables=0
rows=0
list="SELECT CONCAT(table_schema, '.', table_name) FROM information_schema.tables WHERE table_type = 'BASE TABLE' AND table_schema NOT IN ($system)"
for table in $(mariadb --socket="$sock" -u root -N -B -e "$list"); do
  count=$(mariadb --socket="$sock" -u root -N -B -e "SELECT COUNT(*) FROM $table") \
    || fail "the loaded copy cannot count $table"
  tables=$((tables + 1))
  rows=$((rows + count))
done
accounts=$(mariadb --socket="$sock" -u root -N -B -e "SELECT COUNT(*) FROM mysql.user WHERE is_role = 'N' AND user NOT IN ($own)") \
  || fail "the loaded copy cannot count its accounts"
kill "$server"
wait "$server" 2>/dev/null
bytes=$(stat -c %s "$part")
mv "$part" "$dir/$FILE" || fail "cannot move the backup into place on the claim"
# The newest KEEP backups of this cluster stay.
ls -1t "$dir"/"$PREFIX"-*.sql 2>/dev/null | tail -n +$((KEEP + 1)) | xargs -r rm -f
printf 'file=%s gtid=%s bytes=%s tables=%s rows=%s accounts=%s' "$FILE" "$gtid" "$bytes" "$tables" \
  "$rows" "$accounts" >/dev/termination-log
echo "backup: $FILE proven ($tables tables, $rows rows, $accounts accounts, $bytes bytes, GTID $gtid)" >&2
"#;

/// The Pod taking one backup into `file` on the claim, for `reason`
/// ([`BACKUP_REASON_ANNOTATION`]), created at `started` ([`BACKUP_STARTED_ANNOTATION`]); it
/// runs once (`restartPolicy: Never`).
pub fn backup_pod(
    parent: &str,
    namespace: &str,
    image: &str,
    file: &str,
    reason: &str,
    started: &str,
    spec: &MariaDBClusterSpec,
) -> Value {
    let keep = spec.backup.as_ref().map_or(1, |b| b.keep);
    let step = Container::new(BACKUP_CONTAINER, image)
        .field("command", json!(["sh", "-c", BACKUP_SCRIPT]))
        .env("SOURCE", &donor(parent))
        .env("FILE", file)
        .env("PREFIX", parent)
        .env("KEEP", &keep.to_string())
        .env("REPL_USER", REPLICATION_USER)
        .env_from_secret("MYSQL_PWD", &spec.secret(parent), "root-password")
        .mount("backups", "/backups");
    let pod = Pod::new(&backup_pod_name(parent))
        .label(INSTANCE_LABEL, parent)
        .annotation(BACKUP_REASON_ANNOTATION, reason)
        .annotation(BACKUP_STARTED_ANNOTATION, started)
        .claim_volume("backups", &backups_claim_name(parent))
        .spec_field("restartPolicy", json!("Never"));
    let Some(s3) = spec.backup.as_ref().and_then(|b| b.s3.as_ref()) else {
        return pod.container(step).build();
    };
    // With a store, the backup step runs first (an init container): only a proven backup is
    // uploaded.
    let mut built = pod
        .empty_dir_volume("mc-config")
        .spec_field("initContainers", json!([step.build()]))
        .build();
    let object = object_name(s3, namespace, file);
    built["metadata"]["annotations"][BACKUP_LOCATION_ANNOTATION] =
        json!(format!("s3://{}/{object}", s3.bucket));
    built["spec"]["containers"] = json!([{
        "name": UPLOAD_CONTAINER,
        "image": s3.image.as_deref().unwrap_or(DEFAULT_MC_IMAGE),
        "command": [
            "mc", "--config-dir", "/mc", "cp",
            format!("/backups/{file}"),
            format!("{MC_ALIAS}/{}/{object}", s3.bucket),
        ],
        "env": mc_env(&s3.endpoint, &s3.credentials_secret),
        "volumeMounts": [
            {"name": "backups", "mountPath": "/backups", "readOnly": true},
            {"name": "mc-config", "mountPath": "/mc"},
        ],
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }]);
    built
}

/// The annotation on a backup Pod that uploads: where the object goes (`s3://<bucket>/<object>`).
pub const BACKUP_LOCATION_ANNOTATION: &str = "mariadb.policy-host.io/backup-location";

/// Server `pod`'s claim.
pub fn server_claim(parent: &str, pod: &str, spec: &MariaDBClusterSpec) -> Value {
    let mut built = claim(
        &claim_name(pod),
        &spec.storage.size,
        spec.storage.storage_class_name.as_deref(),
    );
    built["metadata"]["labels"] = json!({ INSTANCE_LABEL: parent });
    built
}

/// The Services: writes, reads, and the headless one for stable names.
pub fn services(parent: &str) -> [Value; 3] {
    let ports = [(MYSQL_PORT_NAME, MYSQL_PORT)];
    [
        service(
            &format!("{parent}-primary"),
            &[(INSTANCE_LABEL, parent), (ROLE_LABEL, "primary")],
            &ports,
        ),
        service(
            &format!("{parent}-replicas"),
            &[(INSTANCE_LABEL, parent), (ROLE_LABEL, "replica")],
            &ports,
        ),
        headless_service(&headless_name(parent), &[(INSTANCE_LABEL, parent)], &ports),
    ]
}

/// One server evicted at a time: all of the `servers` wanted but one stay up.
pub fn budget(parent: &str, servers: usize) -> Value {
    let min_available = u32::try_from(servers.saturating_sub(1)).unwrap_or(u32::MAX);
    disruption_budget(parent, &[(INSTANCE_LABEL, parent)], min_available)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_pod_gets_its_identity_its_claim_its_config_and_the_passwords_by_reference() {
        let spec = MariaDBClusterSpec::default();
        let pod = server_pod(
            "db",
            "db-2",
            "mariadb:10.11",
            "r1",
            None,
            Role::Replica,
            &spec,
        );
        let container = &pod["spec"]["containers"][0];
        assert_eq!(
            container["args"],
            json!(["--server-id=3", "--report-host=db-2.db-headless"])
        );
        assert_eq!(pod["metadata"]["labels"][ROLE_LABEL], "replica");
        assert_eq!(pod["spec"]["subdomain"], "db-headless");
        let env = container["env"].as_array().cloned().unwrap_or_default();
        let root = env
            .iter()
            .find(|e| e["name"] == "MARIADB_ROOT_PASSWORD")
            .cloned()
            .unwrap_or_default();
        assert_eq!(root["valueFrom"]["secretKeyRef"]["name"], "db-credentials");
        assert!(
            env.iter().all(|e| e["value"] != "secret"),
            "no password is written into the Pod"
        );
        let volumes = pod["spec"]["volumes"].to_string();
        assert!(volumes.contains("data-db-2") && volumes.contains("db-config"));
        assert_eq!(
            pod["metadata"]["annotations"][CONFIG_REVISION_ANNOTATION],
            "r1"
        );
    }

    #[test]
    fn a_seeded_server_pod_dumps_from_the_primary_service_into_the_init_files_by_reference() {
        let spec = MariaDBClusterSpec::default();
        let pod = server_pod(
            "db",
            "db-3",
            "mariadb:10.11",
            "r1",
            Some(&Seed {
                donor: donor("db"),
                required: true,
                restore: None,
            }),
            Role::Replica,
            &spec,
        );
        assert_eq!(
            pod["metadata"]["annotations"][SEED_ANNOTATION],
            "db-primary"
        );
        assert!(
            pod["metadata"]["annotations"]
                .get(RESTORE_ANNOTATION)
                .is_none()
        );
        let seed = &pod["spec"]["initContainers"][0];
        assert_eq!(seed["image"], "mariadb:10.11");
        assert_eq!(seed["command"][2], SEED_SCRIPT);
        let env = seed["env"].to_string();
        assert!(
            env.contains("db-primary") && env.contains("db-credentials"),
            "{env}"
        );
        assert!(
            !SEED_SCRIPT.contains("password"),
            "no password on a command line"
        );
        let mounts = |c: &Value| c["volumeMounts"].to_string();
        assert!(mounts(seed).contains(INIT_FILES) && mounts(seed).contains("/var/lib/mysql"));
        assert!(mounts(&pod["spec"]["containers"][0]).contains(INIT_FILES));
        assert!(pod["spec"]["volumes"].to_string().contains("emptyDir"));

        // A Pod made before the seed step is rebuilt without it: its spec cannot change.
        let unseeded = server_pod(
            "db",
            "db-3",
            "mariadb:10.11",
            "r1",
            None,
            Role::Replica,
            &spec,
        );
        assert!(unseeded["spec"].get("initContainers").is_none());
        assert!(
            unseeded["metadata"]["annotations"]
                .get(SEED_ANNOTATION)
                .is_none()
        );
    }

    #[test]
    fn a_restoring_server_pod_mounts_the_backup_claim_read_only_and_names_the_file() {
        let spec = MariaDBClusterSpec::default();
        let seed = Seed {
            donor: donor("db"),
            required: false,
            restore: RestoreSource::parse("old-backups/old-20261128T232500Z.sql"),
        };
        let pod = server_pod(
            "db",
            "db-0",
            "mariadb:10.11",
            "r1",
            Some(&seed),
            Role::Replica,
            &spec,
        );
        assert_eq!(
            pod["metadata"]["annotations"][RESTORE_ANNOTATION],
            "old-backups/old-20261128T232500Z.sql"
        );
        let step = &pod["spec"]["initContainers"][0];
        assert!(
            step["env"]
                .to_string()
                .contains("/restore/old-20261128T232500Z.sql")
        );
        assert!(step["volumeMounts"].to_string().contains(RESTORE_MOUNT));
        let volumes = pod["spec"]["volumes"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let restore = volumes
            .iter()
            .find(|v| v["name"] == "restore")
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            restore["persistentVolumeClaim"],
            json!({"claimName": "old-backups", "readOnly": true})
        );
        assert!(SEED_SCRIPT.contains("RESTORE_FILE"));
    }

    #[test]
    fn the_backup_pod_runs_once_on_the_claim_with_the_password_by_reference() {
        let spec = MariaDBClusterSpec {
            backup: Some(crate::spec::Backup {
                every: None,
                trigger: Some("t".into()),
                keep: 4,
                storage: Default::default(),
                s3: None,
            }),
            ..MariaDBClusterSpec::default()
        };
        let pod = backup_pod(
            "db",
            "ns",
            "mariadb:10.11",
            "db-1.sql",
            "trigger:t",
            "2026-11-28T23:25:00Z",
            &spec,
        );
        assert_eq!(pod["spec"]["restartPolicy"], "Never");
        let container = &pod["spec"]["containers"][0];
        assert_eq!(container["name"], BACKUP_CONTAINER);
        let env = container["env"].to_string();
        for wanted in ["db-primary", "db-1.sql", "\"KEEP\"", "db-credentials"] {
            assert!(env.contains(wanted), "{wanted} in {env}");
        }
        assert!(
            !BACKUP_SCRIPT.contains("password"),
            "no password on a command line"
        );
        assert!(pod["spec"]["volumes"].to_string().contains("db-backups"));
        assert_eq!(
            backups_claim("db", &spec).map(|c| c["metadata"]["name"].clone()),
            Some(json!("db-backups"))
        );
        assert!(backups_claim("db", &MariaDBClusterSpec::default()).is_none());
    }

    #[test]
    fn a_backup_to_a_store_is_uploaded_only_after_it_is_proven_under_the_namespace() {
        let spec = MariaDBClusterSpec {
            backup: Some(crate::spec::Backup {
                every: None,
                trigger: Some("t".into()),
                keep: 2,
                storage: Default::default(),
                s3: Some(S3Target {
                    endpoint: "http://10.0.0.1:9000".into(),
                    bucket: "backups".into(),
                    prefix: Some("mariadb".into()),
                    credentials_secret: "s3-keys".into(),
                    image: None,
                }),
            }),
            ..MariaDBClusterSpec::default()
        };
        let pod = backup_pod(
            "db",
            "ns",
            "mariadb:10.11",
            "db-1.sql",
            "trigger:t",
            "t0",
            &spec,
        );
        assert_eq!(pod["spec"]["initContainers"][0]["name"], BACKUP_CONTAINER);
        let upload = &pod["spec"]["containers"][0];
        assert_eq!(upload["name"], UPLOAD_CONTAINER);
        assert_eq!(upload["image"], DEFAULT_MC_IMAGE);
        assert_eq!(
            upload["command"],
            json!([
                "mc",
                "--config-dir",
                "/mc",
                "cp",
                "/backups/db-1.sql",
                "s3/backups/mariadb/ns/db-1.sql"
            ])
        );
        assert_eq!(
            pod["metadata"]["annotations"][BACKUP_LOCATION_ANNOTATION],
            "s3://backups/mariadb/ns/db-1.sql"
        );
        let env = upload["env"].to_string();
        assert!(
            env.contains("s3-keys") && env.contains("$(S3_ACCESS_KEY_ID)"),
            "{env}"
        );
        assert!(
            !env.contains("secretAccessKey\":\""),
            "keys by reference only"
        );
    }

    #[test]
    fn a_server_restoring_from_a_store_downloads_the_object_before_its_seed_step() {
        let object = S3Object {
            endpoint: "http://10.0.0.1:9000".into(),
            bucket: "backups".into(),
            key: "mariadb/ns/old-1.sql".into(),
            credentials_secret: "s3-keys".into(),
            image: None,
        };
        let source = RestoreSource::S3(object.clone());
        assert_eq!(
            RestoreSource::parse(&source.annotation()),
            Some(source.clone())
        );
        assert_eq!(source.describe(), "s3://backups/mariadb/ns/old-1.sql");
        let seed = Seed {
            donor: donor("db"),
            required: false,
            restore: Some(source),
        };
        let spec = MariaDBClusterSpec::default();
        let pod = server_pod(
            "db",
            "db-0",
            "mariadb:10.11",
            "r1",
            Some(&seed),
            Role::Replica,
            &spec,
        );
        let init = pod["spec"]["initContainers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let names: Vec<&str> = init.iter().filter_map(|c| c["name"].as_str()).collect();
        assert_eq!(names, ["download", "seed"]);
        assert_eq!(init[0]["command"][4], "s3/backups/mariadb/ns/old-1.sql");
        assert_eq!(init[0]["command"][5], "/restore/old-1.sql");
        assert!(init[1]["env"].to_string().contains("/restore/old-1.sql"));
        let volumes = pod["spec"]["volumes"].to_string();
        assert!(volumes.contains("\"restore\"") && volumes.contains("emptyDir"));
    }

    #[test]
    fn own_options_follow_the_plugins_and_change_the_revision() {
        let plain = MariaDBClusterSpec::default();
        let tuned = MariaDBClusterSpec {
            config: [
                ("max_connections".to_owned(), "500".to_owned()),
                ("skip_name_resolve".to_owned(), String::new()),
            ]
            .into(),
            ..MariaDBClusterSpec::default()
        };
        let text = config_text(&tuned);
        assert!(text.starts_with(SERVER_CONFIG), "{text}");
        assert!(
            text.ends_with("max_connections = 500\nskip_name_resolve\n"),
            "{text}"
        );
        assert_eq!(config_revision(&plain), config_revision(&plain.clone()));
        assert_ne!(config_revision(&plain), config_revision(&tuned));
        assert_eq!(config_revision(&plain).len(), 16);
    }

    #[test]
    fn the_server_config_turns_on_what_failover_relies_on() {
        for line in [
            "gtid_strict_mode = ON",
            "log_slave_updates = ON",
            "binlog_format = ROW",
            "read_only = ON",
            "skip_slave_start\n",
            "rpl_semi_sync_master_wait_point = AFTER_SYNC",
        ] {
            assert!(SERVER_CONFIG.contains(line), "{line}");
        }
    }

    #[test]
    fn the_budget_keeps_all_servers_but_one_without_the_parents_scale_subresource() {
        assert_eq!(budget("db", 3)["spec"]["minAvailable"], 2);
        assert_eq!(budget("db", 1)["spec"]["minAvailable"], 0);
        assert!(budget("db", 3)["spec"].get("maxUnavailable").is_none());
    }

    #[test]
    fn services_select_by_role() {
        let [primary, replicas, headless] = services("db");
        assert_eq!(primary["spec"]["selector"][ROLE_LABEL], "primary");
        assert_eq!(replicas["spec"]["selector"][ROLE_LABEL], "replica");
        assert_eq!(headless["spec"]["clusterIP"], "None");
        assert!(headless["spec"]["selector"].get(ROLE_LABEL).is_none());
    }
}

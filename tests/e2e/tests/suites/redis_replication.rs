//! The Redis plugin end to end: a real kube-apiserver, the pod runner running real
//! `redis-server` processes, policy-host in-process with the compiled `guest-redis` component
//! reaching Redis only through the generic `exchange` capability, and assertions through a
//! real Redis client (`redis-cli`).

use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use policy_host::decide::Limits;
use policy_host_e2e::{HostUnderTest, init_logging, install_crd};
use policy_host_testenv::images::MadeImage;
use policy_host_testenv::{shared_node, wait_for};
use serde_json::{Value, json};

const CONVERGE: Duration = Duration::from_secs(180);

/// Keys written (and acknowledged by both replicas) before the primary is killed.
const KEYS: usize = 200;

fn redis_replications() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("redis.policy-host.io", "v1alpha1", "RedisReplication"),
        "redisreplications",
    )
}

fn example(replicas: i64) -> anyhow::Result<Value> {
    let text = std::fs::read_to_string(
        policy_host_e2e::repo_root().join("deploy/examples/redis-replication.yaml"),
    )?;
    let mut object: Value = serde_yaml::from_str(&text)?;
    object["spec"]["replicas"] = json!(replicas);
    Ok(object)
}

/// Runs `commands` (one per line) on one connection to `host`, returning the reply lines.
fn redis(cli: &MadeImage, host: &str, commands: &str) -> anyhow::Result<Vec<String>> {
    use std::io::Write;
    let mut command = cli.command("redis-cli")?;
    let mut child = command
        .args(["-h", host, "-p", "6379"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    child
        .stdin
        .take()
        .ok_or_else(|| anyhow::anyhow!("no stdin"))?
        .write_all(commands.as_bytes())?;
    let output = child.wait_with_output()?;
    if !output.status.success() {
        anyhow::bail!(
            "redis-cli against {host} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect())
}

/// `INFO replication` of one server as key → value.
fn replication(cli: &MadeImage, host: &str) -> anyhow::Result<Vec<(String, String)>> {
    Ok(redis(cli, host, "INFO replication\n")?
        .into_iter()
        .filter_map(|l| {
            let (k, v) = l.trim().split_once(':')?;
            Some((k.to_owned(), v.to_owned()))
        })
        .collect())
}

fn field(info: &[(String, String)], key: &str) -> Option<String> {
    info.iter().find(|(k, _)| k == key).map(|(_, v)| v.clone())
}

fn pod_ip(pod: &Pod) -> Option<String> {
    pod.status
        .as_ref()?
        .pod_ip
        .clone()
        .filter(|ip| !ip.is_empty())
}

/// Waits until the status names a primary that serves and `following` replicas follow it.
async fn converged(
    objects: &Api<DynamicObject>,
    name: &str,
    following: i64,
    not_primary: Option<&str>,
) -> anyhow::Result<Value> {
    let what = format!(
        "{name} to have a serving primary (not {not_primary:?}) with {following} following replicas"
    );
    Ok(wait_for(&what, CONVERGE, || async {
        let object = objects.get_opt(name).await.ok().flatten()?;
        let status = object.data.get("status")?.clone();
        let primary = status["primary"].as_str()?;
        let available = status["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "Available" && c["status"] == "True");
        (available
            && Some(primary) != not_primary
            && status["followingReplicas"] == json!(following))
        .then_some(status)
    })
    .await?)
}

/// Waits until the client Service's selector selects exactly the Pod whose IP is `ip`.
async fn service_points_at(
    client: &kube::Client,
    namespace: &str,
    service: &str,
    ip: &str,
) -> anyhow::Result<()> {
    let services: Api<Service> = Api::namespaced(client.clone(), namespace);
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    wait_for(
        &format!("Service {service} to select the pod at {ip} only"),
        CONVERGE,
        || async {
            let selector = services.get(service).await.ok()?.spec?.selector?;
            let selector: Vec<String> = selector.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let selected = pods
                .list(&ListParams::default().labels(&selector.join(",")))
                .await
                .ok()?;
            let ips: Vec<String> = selected.items.iter().filter_map(pod_ip).collect();
            (ips == [ip.to_owned()]).then_some(())
        },
    )
    .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_servers_replicate_and_fail_over_without_losing_acknowledged_writes()
-> anyhow::Result<()> {
    init_logging();
    let env = shared_node().await?;
    let client = env.client().await?;
    install_crd(&client, "deploy/crds/redisreplication.yaml").await?;
    let namespace = env.create_namespace("redis-failover").await?;
    let plugin =
        policy_host_test_plugins::build("guest-redis").map_err(|e| anyhow::anyhow!("{e}"))?;
    let host = HostUnderTest::start(env, &[plugin], &namespace, Limits::default()).await?;
    // redis-cli of the node's Redis image (guest-redis/test-images.yaml), run from here.
    let cli = policy_host_e2e::apps::redis_image(env)?;

    let objects: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), &namespace, &redis_replications());
    let object = example(3)?;
    let name = object["metadata"]["name"]
        .as_str()
        .unwrap_or("example-redis")
        .to_string();
    let applied = std::time::Instant::now();
    objects
        .patch(
            &name,
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&object),
        )
        .await?;

    // One primary, two replicas following it, as Redis itself says.
    let status = converged(&objects, &name, 2, None).await?;
    eprintln!(
        "figure: apply -> primary + 2 following took {:.1} s",
        applied.elapsed().as_secs_f64()
    );
    let primary = status["primary"].as_str().unwrap_or_default().to_owned();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let ip_of = |pod: &str| {
        let pods = pods.clone();
        let pod = pod.to_owned();
        async move {
            pods.get(&pod)
                .await
                .ok()
                .as_ref()
                .and_then(pod_ip)
                .ok_or_else(|| anyhow::anyhow!("pod {pod} has no IP"))
        }
    };
    let primary_ip = ip_of(&primary).await?;
    let info = replication(cli, &primary_ip)?;
    assert_eq!(field(&info, "role").as_deref(), Some("master"), "{info:?}");
    assert_eq!(
        field(&info, "connected_slaves").as_deref(),
        Some("2"),
        "{info:?}"
    );
    service_points_at(&client, &namespace, &name, &primary_ip).await?;

    // Writes acknowledged by both replicas (WAIT 2 on the writing connection).
    let mut batch: String = (0..KEYS)
        .map(|i| format!("SET key-{i} value-{i}\n"))
        .collect();
    batch.push_str("WAIT 2 5000\n");
    let replies = redis(cli, &primary_ip, &batch)?;
    assert_eq!(replies.len(), KEYS + 1, "{replies:?}");
    assert!(replies[..KEYS].iter().all(|r| r == "OK"), "{replies:?}");
    assert_eq!(replies[KEYS], "2", "both replicas acknowledged every write");

    // Readable on each replica.
    let replicas: Vec<String> = status["replicas"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r.as_str().map(str::to_owned))
        .collect();
    assert_eq!(replicas.len(), 2, "{status}");
    for replica in &replicas {
        let ip = ip_of(replica).await?;
        let info = replication(cli, &ip)?;
        assert_eq!(
            field(&info, "role").as_deref(),
            Some("slave"),
            "{replica}: {info:?}"
        );
        assert_eq!(
            field(&info, "master_host"),
            Some(primary_ip.clone()),
            "{replica}: {info:?}"
        );
        let read = redis(cli, &ip, "GET key-42\nDBSIZE\n")?;
        assert_eq!(read, ["value-42".to_owned(), KEYS.to_string()], "{replica}");
    }

    // Kill the primary: a replica is promoted, the Service follows it, no acknowledged write is lost.
    let killed = std::time::Instant::now();
    env.kill_pod(&namespace, &primary).await?;
    let status = converged(&objects, &name, 1, Some(&primary)).await?;
    let promoted = status["primary"].as_str().unwrap_or_default().to_owned();
    eprintln!(
        "figure: primary killed -> {promoted} promoted took {:.1} s",
        killed.elapsed().as_secs_f64()
    );
    assert!(
        replicas.contains(&promoted),
        "{promoted} was a replica: {replicas:?}"
    );
    let promoted_ip = ip_of(&promoted).await?;
    let info = replication(cli, &promoted_ip)?;
    assert_eq!(field(&info, "role").as_deref(), Some("master"), "{info:?}");
    service_points_at(&client, &namespace, &name, &promoted_ip).await?;
    let keys: String = (0..KEYS).map(|i| format!("GET key-{i}\n")).collect();
    let values = redis(cli, &promoted_ip, &keys)?;
    let expected: Vec<String> = (0..KEYS).map(|i| format!("value-{i}")).collect();
    assert_eq!(
        values, expected,
        "every acknowledged write survived the failover"
    );

    // The dead server comes back as a fresh replica of the new primary and copies the data.
    let status = converged(&objects, &name, 2, Some(&primary)).await?;
    assert_eq!(status["primary"], json!(promoted), "{status}");
    let recreated_ip = ip_of(&primary).await?;
    let info = replication(cli, &recreated_ip)?;
    assert_eq!(
        field(&info, "master_host"),
        Some(promoted_ip.clone()),
        "{info:?}"
    );
    let write = redis(cli, &promoted_ip, "SET after failover\nWAIT 2 5000\n")?;
    assert_eq!(
        write,
        ["OK", "2"],
        "writes after the failover reach both replicas"
    );
    let read = redis(cli, &recreated_ip, "GET key-7\nGET after\n")?;
    assert_eq!(read, ["value-7", "failover"]);

    host.stop().await;
    Ok(())
}

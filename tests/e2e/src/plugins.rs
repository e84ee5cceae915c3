//! Helpers of the suites that load plugins through ConfigMaps: applying a pack as the admin
//! would, waiting for the Event the host records about an object, and making a component
//! bigger without changing what it does.

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use policy_host_testenv::wait_for;

/// How long the host may take to act on a pack or a parent.
pub const WAIT: Duration = Duration::from_secs(90);

/// Replaces a pack ConfigMap by server-side apply (a full replace: keys of an earlier version
/// do not linger), under its own name.
pub async fn apply_pack(
    config_maps: &Api<ConfigMap>,
    mut cm: ConfigMap,
    manager: &str,
) -> anyhow::Result<()> {
    cm.metadata.managed_fields = None;
    let name = cm.name_any();
    config_maps
        .patch(
            &name,
            &PatchParams::apply(manager).force(),
            &Patch::Apply(&cm),
        )
        .await?;
    Ok(())
}

/// Waits for an Event about the object `regarding` with `reason` whose note passes `matches`,
/// and returns it.
pub async fn event_about(
    events: &Api<Event>,
    regarding: &str,
    reason: &str,
    matches: impl Fn(&str) -> bool,
) -> anyhow::Result<Event> {
    Ok(wait_for(
        &format!("a {reason} Event about {regarding}"),
        WAIT,
        || async {
            events
                .list(&ListParams::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|e| {
                    e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(regarding)
                        && e.reason.as_deref() == Some(reason)
                        && matches(e.note.as_deref().unwrap_or_default())
                })
        },
    )
    .await?)
}

/// `component` with a custom section (`padding`) of `extra` zero bytes appended: the same
/// plugin, as big as a component of another language, to exercise size limits and pulls.
pub fn padded(component: &[u8], extra: usize) -> Vec<u8> {
    fn leb128(mut value: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (value & 0x7f) as u8;
            value >>= 7;
            if value == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let name = b"padding";
    let mut body = Vec::new();
    leb128(name.len(), &mut body);
    body.extend_from_slice(name);
    body.resize(body.len() + extra, 0);
    let mut out = component.to_vec();
    // Section id 0: a custom section, which every reader skips.
    out.push(0);
    leb128(body.len(), &mut out);
    out.extend_from_slice(&body);
    out
}

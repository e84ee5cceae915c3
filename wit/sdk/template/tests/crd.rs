//! `crd.yaml` is generated from the spec type and current (`cargo test --features crd`).
#![cfg(feature = "crd")]

#[test]
fn crd_yaml_is_generated_from_the_spec_type() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("crd.yaml");
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    let generated = plugin_template::crd_yaml().expect("the CRD renders as YAML");
    assert!(
        on_disk == generated,
        "{} is not what the spec type generates; run `cargo run --features crd --bin crdgen > crd.yaml`",
        path.display()
    );
}

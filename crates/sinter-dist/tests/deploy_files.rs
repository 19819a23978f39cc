//! The deployment files in `deploy/` stay consistent with the launcher and rendezvous.

use std::path::PathBuf;

fn deploy(p: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../deploy")
        .join(p);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[test]
fn kubernetes_manifest_wires_index_to_node_rank() {
    let y = deploy("k8s/sinter-train.yaml");
    for want in [
        "kind: Service",
        "clusterIP: None",
        "kind: Job",
        "completionMode: Indexed",
        "completions: 4",
        "parallelism: 4",
        "subdomain: sinter-train",
        "batch.kubernetes.io/job-completion-index",
        "nvidia.com/gpu: 8",
        "value: sinter-train-0.sinter-train",
        "- $(NODE_RANK)",
        "- --nproc-per-node",
        "- --master-addr",
    ] {
        assert!(y.contains(want), "manifest lacks `{want}`");
    }
    assert!(!y.contains('\t'), "YAML must not contain tabs");
}

#[test]
fn slurm_scripts_parse_and_use_slurm_ids() {
    for (f, wants) in [
        (
            "slurm/sinter-node.sbatch",
            &[
                "--node-rank \"$SLURM_NODEID\"",
                "sinter launch",
                "--kill-on-bad-exit=1",
                "#SBATCH --ntasks-per-node=1",
            ][..],
        ),
        (
            "slurm/sinter-gpu.sbatch",
            &[
                "#SBATCH --ntasks-per-node=8",
                "--kill-on-bad-exit=1",
                "SLURM_JOB_NODELIST",
            ][..],
        ),
    ] {
        let s = deploy(f);
        for w in wants {
            assert!(s.contains(w), "{f} lacks `{w}`");
        }
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../deploy")
            .join(f);
        let st = std::process::Command::new("bash")
            .arg("-n")
            .arg(&path)
            .status()
            .unwrap();
        assert!(st.success(), "{f} has a bash syntax error");
    }
    assert!(deploy("README.md").contains("Indexed Job"));
}

/// Runs deploy/k8s/schemas/validate.py on `files`; `None` when python3 with jsonschema and
/// PyYAML is missing (a skip, unless SINTER_REQUIRE_JSONSCHEMA=1 as in CI).
fn validate(files: &[&std::path::Path]) -> Option<std::process::Output> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let have = std::process::Command::new("python3")
        .args(["-c", "import jsonschema, yaml"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !have {
        assert!(
            std::env::var("SINTER_REQUIRE_JSONSCHEMA").as_deref() != Ok("1"),
            "SINTER_REQUIRE_JSONSCHEMA=1 but python3 cannot import jsonschema and yaml (pip install jsonschema pyyaml)"
        );
        eprintln!("skipping the CRD schema check: python3 with jsonschema and PyYAML not found (pip install jsonschema pyyaml)");
        return None;
    }
    Some(
        std::process::Command::new("python3")
            .arg(root.join("deploy/k8s/schemas/validate.py"))
            .args(files)
            .output()
            .unwrap(),
    )
}

#[test]
fn trainjob_and_jobset_manifests_pass_the_published_crd_schemas() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy/k8s");
    let (tj, js) = (
        root.join("sinter-trainjob.yaml"),
        root.join("sinter-jobset.yaml"),
    );
    let Some(o) = validate(&[&tj, &js]) else {
        return;
    };
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success(),
        "{out}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Both documents were checked against a schema, not skipped.
    assert!(out.contains("(TrainJob sinter-train): valid"), "{out}");
    assert!(out.contains("(JobSet sinter-train): valid"), "{out}");
    // sinter launch reads what these manifests give it.
    let t = deploy("k8s/sinter-trainjob.yaml");
    for want in [
        "name: torch-distributed",
        "numProcPerNode: 8",
        "- --max-restarts",
    ] {
        assert!(t.contains(want), "TrainJob lacks `{want}`");
    }
    let j = deploy("k8s/sinter-jobset.yaml");
    for want in [
        "jobset.sigs.k8s.io/jobset-name",
        "jobset.sigs.k8s.io/replicatedjob-name",
        "name: JOBSET_SUBDOMAIN",
        "subdomain: sinter-train",
        "completionMode: Indexed",
    ] {
        assert!(j.contains(want), "JobSet lacks `{want}`");
    }
}

#[test]
fn the_schema_check_fails_on_a_wrong_type_a_missing_field_and_an_unknown_field() {
    let dir = std::env::temp_dir().join(format!("sinter-crd-check-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let t = deploy("k8s/sinter-trainjob.yaml");
    let j = deploy("k8s/sinter-jobset.yaml");
    let cases = [
        (
            "wrong-type.yaml",
            t.replace("numNodes: 4", "numNodes: four"),
            "at spec.trainer.numNodes: 'four' is not of type 'integer'",
        ),
        (
            "no-runtime-name.yaml",
            t.replace("    name: torch-distributed\n", ""),
            "at spec.runtimeRef: 'name' is a required property",
        ),
        (
            "no-template.yaml",
            // A replicated job without its Job template.
            j.replace(
                "      template:\n        spec:\n          completionMode",
                "      x:\n        spec:\n          completionMode",
            ),
            "'template' is a required property",
        ),
        (
            "unknown-field.yaml",
            j.replace("enableDNSHostnames: true", "enableDnsHostnames: true"),
            "'enableDnsHostnames' was unexpected",
        ),
    ];
    let mut paths = Vec::new();
    for (name, text, _) in &cases {
        assert!(*text != t && *text != j, "{name}: the edit did not apply");
        let p = dir.join(name);
        std::fs::write(&p, text).unwrap();
        paths.push(p);
    }
    // One run for all four files (each python start loads the schemas again).
    let o = validate(&paths.iter().map(|p| p.as_path()).collect::<Vec<_>>());
    for p in &paths {
        let _ = std::fs::remove_file(p);
    }
    let Some(o) = o else {
        let _ = std::fs::remove_dir(&dir);
        return;
    };
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(!o.status.success(), "the broken manifests passed:\n{out}");
    for ((name, _, want), p) in cases.iter().zip(&paths) {
        let lines: Vec<&str> = out
            .lines()
            .filter(|l| l.starts_with(p.to_str().unwrap()))
            .collect();
        assert!(
            lines.iter().any(|l| l.contains(want)) && !lines.iter().any(|l| l.ends_with(": valid")),
            "{name}: expected `{want}` in:\n{out}"
        );
    }
    let _ = std::fs::remove_dir(&dir);
}

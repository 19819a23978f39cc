//! `--param-group PATTERN:lr=X,weight_decay=Y`: optimizer parameter groups from the command
//! line. A run's parameters start in the default groups ([`sinter_nn::decay_groups`]: biases
//! and norm gains do not decay); each rule then takes the parameters whose name matches its
//! pattern (a regular expression searched in the name, e.g. `bias$`, `^wte`, `ln_|norm`; the
//! first matching rule wins) and sets their learning rate and/or weight decay. What a rule
//! leaves out stays as the default groups have it. The schedule scales every group's rate
//! alike, as PyTorch's schedulers do.

use anyhow::{anyhow, bail, Context, Result};
use regex::Regex;
use sinter_core::Tensor;
use sinter_nn::ParamGroup;

/// One `--param-group` rule.
#[derive(Clone, Debug)]
pub struct Rule {
    pattern: Regex,
    lr: Option<f64>,
    weight_decay: Option<f64>,
}

impl Rule {
    /// Parses `PATTERN:key=value[,key=value]` (keys: lr, weight_decay).
    pub fn parse(spec: &str) -> Result<Rule> {
        let usage = "write PATTERN:lr=X, PATTERN:weight_decay=Y or PATTERN:lr=X,weight_decay=Y";
        let (pattern, settings) = spec
            .rsplit_once(':')
            .ok_or_else(|| anyhow!("--param-group '{spec}' has no ':'; {usage}"))?;
        let pattern = Regex::new(pattern).with_context(|| {
            format!("--param-group '{spec}': '{pattern}' is not a regular expression")
        })?;
        let mut rule = Rule {
            pattern,
            lr: None,
            weight_decay: None,
        };
        for kv in settings.split(',') {
            let (k, v) = kv.split_once('=').ok_or_else(|| {
                anyhow!("--param-group '{spec}': '{kv}' is not key=value; {usage}")
            })?;
            let v: f64 = v
                .trim()
                .parse()
                .ok()
                .filter(|v: &f64| v.is_finite() && *v >= 0.0)
                .ok_or_else(|| {
                    anyhow!("--param-group '{spec}': {k} must be a number of at least 0, got '{v}'")
                })?;
            let slot = match k.trim().replace('-', "_").as_str() {
                "lr" => &mut rule.lr,
                "weight_decay" => &mut rule.weight_decay,
                _ => {
                    bail!("--param-group '{spec}': unknown setting '{k}'; valid: lr, weight_decay")
                }
            };
            if slot.replace(v).is_some() {
                bail!("--param-group '{spec}' sets {k} twice");
            }
        }
        Ok(rule)
    }
}

/// Checks every rule of a config (flags and checkpoints alike).
pub fn check(specs: &[String]) -> Result<()> {
    specs.iter().try_for_each(|s| Rule::parse(s).map(drop))
}

/// Refuses a rule that matches no parameter of the model (`params`: all of them, named),
/// listing some names. Checked once on the whole model: a pipeline stage or a tensor-parallel
/// shard holds only some of the parameters.
pub fn check_matches(specs: &[String], params: &[(String, Tensor)]) -> Result<()> {
    for spec in specs {
        let rule = Rule::parse(spec)?;
        if !params.iter().any(|(n, _)| rule.pattern.is_match(n)) {
            let some: Vec<&str> = params.iter().take(8).map(|(n, _)| n.as_str()).collect();
            bail!(
                "--param-group '{spec}' matches no parameter of this model (its {} parameters are named like {}, …)",
                params.len(),
                some.join(", ")
            );
        }
    }
    Ok(())
}

/// The groups of `params`: the default groups, each split by the first rule that matches
/// each parameter.
pub fn assign(
    specs: &[String],
    params: Vec<(String, Tensor)>,
    weight_decay: f64,
) -> Result<Vec<ParamGroup>> {
    let rules: Vec<Rule> = specs
        .iter()
        .map(|s| Rule::parse(s))
        .collect::<Result<_>>()?;
    let mut out = Vec::new();
    for default in sinter_nn::decay_groups(params, weight_decay) {
        // by_rule[i]: the parameters rule i takes; the last slot keeps the rest.
        let mut by_rule: Vec<Vec<(String, Tensor)>> = vec![Vec::new(); rules.len() + 1];
        for (n, p) in default.params {
            let i = rules
                .iter()
                .position(|r| r.pattern.is_match(&n))
                .unwrap_or(rules.len());
            by_rule[i].push((n, p));
        }
        for (i, params) in by_rule.into_iter().enumerate() {
            if params.is_empty() {
                continue;
            }
            let mut g = ParamGroup {
                params,
                lr: default.lr,
                weight_decay: default.weight_decay,
            };
            if let Some(r) = rules.get(i) {
                g.lr = r.lr.or(g.lr);
                g.weight_decay = r.weight_decay.or(g.weight_decay);
            }
            out.push(g);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sinter_core::Device;

    fn p(name: &str, shape: &[usize]) -> (String, Tensor) {
        let t = Tensor::zeros(shape, sinter_core::DType::F32, Device::Cpu).unwrap();
        (name.to_string(), t)
    }

    /// (names, lr, weight decay) of each group.
    fn layout(groups: &[ParamGroup]) -> Vec<(Vec<&str>, Option<f64>, Option<f64>)> {
        groups
            .iter()
            .map(|g| {
                let names = g.params.iter().map(|(n, _)| n.as_str()).collect();
                (names, g.lr, g.weight_decay)
            })
            .collect()
    }

    #[test]
    fn rules_split_the_default_groups_and_keep_what_they_leave_out() {
        let params = vec![
            p("wte.weight", &[10, 4]),
            p("fc.weight", &[4, 4]),
            p("fc.bias", &[4]),
            p("ln.weight", &[4]),
        ];
        let specs = vec![
            "^wte:lr=0.0001".to_string(),
            "bias$:weight_decay=0.3,lr=0".to_string(),
        ];
        let groups = assign(&specs, params, 0.1).unwrap();
        assert_eq!(
            layout(&groups),
            vec![
                (vec!["wte.weight"], Some(0.0001), Some(0.1)),
                (vec!["fc.weight"], None, Some(0.1)),
                (vec!["fc.bias"], Some(0.0), Some(0.3)),
                (vec!["ln.weight"], None, Some(0.0)),
            ]
        );
        let e = check_matches(&["^nothing:lr=1".into()], &[p("fc.weight", &[2, 2])])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("matches no parameter") && e.contains("fc.weight"),
            "{e}"
        );
    }

    #[test]
    fn bad_rules_say_what_is_wrong() {
        for (spec, want) in [
            ("bias", "has no ':'"),
            ("bias:lr", "not key=value"),
            ("bias:lr=-1", "at least 0"),
            ("bias:lr=NaN", "at least 0"),
            ("bias:momentum=1", "unknown setting 'momentum'"),
            ("bias:lr=1,lr=2", "sets lr twice"),
            ("(:lr=1", "not a regular expression"),
        ] {
            let e = format!("{:#}", Rule::parse(spec).unwrap_err());
            assert!(e.contains(want), "{spec}: {e}");
        }
        assert!(Rule::parse("a:b:lr=1").is_ok(), "the last ':' separates");
    }
}

//! The status variables (`$upstrand_path`, `$upstrand_status`, ...) and `dynamic_upstrand`.

use super::*;

// ---- 7. status variables ------------------------------------------------------------------

pub(super) fn status_variables_format() -> CaseResult {
    let n = Nginx::start(&three_and_backup("", "5xx", 503, 502, 200))?;
    n.get_on(0, "/")?;
    let lines = access_log(&n, 1)?;
    let f: Vec<&str> = lines[0].split('|').collect();
    check_eq(f.len(), 10, "fields")?;
    let (p1, p2, p3) = (n.ports()[1], n.ports()[2], n.ports()[3]);
    check_eq(f[2], "u01 -> u02 -> b01", "$upstrand_path")?;
    check_eq(
        f[3].to_string(),
        format!("(u01) 127.0.0.1:{p1} (u02) 127.0.0.1:{p2} (b01) 127.0.0.1:{p3}"),
        "$upstrand_addr",
    )?;
    check_eq(f[4], "(u01) 503 (u02) 502 (b01) 200", "$upstrand_status")?;
    check_eq(f[5], "(u01) - (u02) - (b01) -", "$upstrand_cache_status")?;
    check_eq(f[8], "(u01) 8 (u02) 8 (b01) 8", "$upstrand_response_length")?;
    for (i, name) in [
        (6, "connect_time"),
        (7, "header_time"),
        (9, "response_time"),
    ] {
        let parts: Vec<&str> = f[i].split(' ').collect();
        check(
            parts.len() == 6
                && parts[0] == "(u01)"
                && parts[2] == "(u02)"
                && parts[4] == "(b01)"
                && [1, 3, 5].iter().all(|j| parts[*j].parse::<f64>().is_ok()),
            || format!("$upstrand_{name}: {}", f[i]),
        )?;
    }
    Ok(())
}

pub(super) fn status_variables_outside_upstrand_are_not_found() -> CaseResult {
    let n = Nginx::start(&front("location / { return 200 \"plain\\n\"; }"))?;
    n.get_on(0, "/")?;
    let lines = access_log(&n, 1)?;
    check_eq(lines[0].as_str(), "/|200|-|-|-|-|-|-|-|-", "log line")
}

// ---- 8. dynamic_upstrand ------------------------------------------------------------------

/// Every row of the seed's worked example (u0x fail, so the backup names the upstrand).
pub(super) fn dynamic_upstrand_seed_example() -> CaseResult {
    let n = Nginx::start(&config(
        &[("u01", 1), ("u02", 2), ("b01", 3), ("b02", 4)],
        "upstrand us1 { upstream ~^u0; upstream b01 backup; order start_random; next_upstream_statuses 5xx; }
         upstrand us2 { upstream ~^u0; upstream b02 backup; order start_random; next_upstream_statuses 5xx; }",
        "dynamic_upstrand $dus1 $arg_a us2;
         location / {
             dynamic_upstrand $dus2 $arg_b;
             if ($arg_b) {
                 proxy_pass http://$dus2;
                 break;
             }
             proxy_pass http://$dus1;
         }",
        &[(1, "u01", 503), (2, "u02", 503), (3, "b01", 200), (4, "b02", 200)],
    ))?;
    n.expect_log("invalid URL prefix in \"http://\"");
    let rows: &[(&str, u16, Option<&str>)] = &[
        ("/", 200, Some("b02")),
        ("/?a=us1", 200, Some("b01")),
        ("/?a=US1", 200, Some("b01")),
        ("/?a=us2", 200, Some("b02")),
        ("/?a=nope", 500, None),
        ("/?a=addr", 500, None),
        ("/?b=us1", 200, Some("b01")),
        ("/?b=us2&a=us1", 200, Some("b02")),
        ("/?b=nope", 500, None),
        ("/?b=nope&a=us1", 500, None),
        ("/?b=&a=us1", 200, Some("b01")),
        ("/?a=&b=", 200, Some("b02")),
    ];
    for (path, status, from) in rows {
        let a = n.get_on(0, path)?;
        check_eq(a.status, *status, &format!("status of {path}"))?;
        if let Some(f) = from {
            check_eq(a.header("X-From"), Some(*f), &format!("answer of {path}"))?;
        }
    }
    Ok(())
}

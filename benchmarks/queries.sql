-- Analysis queries over a saved e-graph (relsat optimize ... --db FILE).
--
-- Run one with:  relsat query FILE "SQL" [--format table|csv|json]
-- These are the five queries of the README's "Analysis queries" section, in the
-- same order and with the same text (tests/test_queries.py checks that the two
-- agree and runs each one against a freshly optimized model).  Each query starts
-- at a "-- name:" line and ends with a semicolon.

-- name: rules_per_round
-- Which rules fired most in each round: the top 3 per round by matches applied (ties kept), with what
-- they added: e-nodes built and applications (union pairs queued plus new nodes put straight into the
-- matched e-class; banned rules' matches were not applied).
SELECT round, rule, matches, new_nodes, applied AS applications, round(seconds, 3) AS seconds
FROM rule_stats
WHERE matches > 0 AND NOT banned
QUALIFY rank() OVER (PARTITION BY round ORDER BY matches DESC) <= 3
ORDER BY round, matches DESC, rule;

-- name: egraph_size_per_round
-- The size of the e-graph after each round, how many of that round's e-nodes are still there, the
-- e-class ids merged by its rebuild, and where its time went.
SELECT i.round, i.enodes, i.eclasses, coalesce(n.kept, 0) AS new_enodes_kept, i.unions,
       round(i.match_s, 3) AS match_s, round(i.apply_s, 3) AS apply_s, round(i.rebuild_s, 3) AS rebuild_s,
       i.stop_reason
FROM iterations i
LEFT JOIN (SELECT ts, count(*) AS kept FROM enodes GROUP BY ts) n ON n.ts = i.round
ORDER BY i.round;

-- name: changed_eclasses
-- Which e-classes the chosen graph changed compared with the original: the original graph is
-- rebuilt from the outputs through the oldest e-node of each e-class (the imported one).
WITH RECURSIVE
first AS MATERIALIZED (SELECT eclass, min(id) AS node, arg_min(children, id) AS children
                       FROM enodes GROUP BY eclass),
outputs AS (SELECT eclass FROM extraction
            EXCEPT SELECT unnest(n.children) FROM extraction x JOIN enodes n ON n.id = x.node),
original(eclass) AS (SELECT eclass FROM outputs
                     UNION SELECT unnest(f.children) FROM original o JOIN first f USING (eclass)),
before AS (SELECT o.eclass, f.node FROM original o JOIN first f USING (eclass))
SELECT coalesce(x.eclass, b.eclass) AS eclass,
       CASE WHEN b.node IS NULL THEN 'added' WHEN x.node IS NULL THEN 'dropped' ELSE 'replaced' END AS change,
       ob.op AS original_op, ox.op AS chosen_op, e.shape, e.is_const
FROM extraction x
FULL JOIN before b ON b.eclass = x.eclass
LEFT JOIN enodes ob ON ob.id = b.node
LEFT JOIN enodes ox ON ox.id = x.node
LEFT JOIN eclasses e ON e.id = coalesce(x.eclass, b.eclass)
WHERE x.node IS DISTINCT FROM b.node
ORDER BY e.is_const, change DESC, eclass;

-- name: most_expensive_chosen
-- The most expensive nodes of the chosen graph, with their share of its total cost.
SELECT x.eclass, n.op, n.id AS node, e.shape, round(c.ms, 4) AS ms, c.source,
       round(100 * c.ms / sum(c.ms) OVER (), 1) AS pct_of_total
FROM extraction x
JOIN enodes n ON n.id = x.node
JOIN costs c ON c.node = x.node
JOIN eclasses e ON e.id = x.eclass
ORDER BY c.ms DESC, x.eclass
LIMIT 10;

-- name: rejected_alternatives
-- The alternatives the extraction rejected for one e-class (here the chosen e-class with the
-- most e-nodes; put "SELECT 42 AS eclass" in pick to look at e-class 42), with their own costs
-- and how many of their children lie outside the chosen graph.
WITH pick AS (SELECT x.eclass FROM extraction x JOIN eclasses e ON e.id = x.eclass
              ORDER BY e.size DESC, x.eclass LIMIT 1),
chosen AS (SELECT list(eclass) AS classes, list(node) AS nodes FROM extraction)
SELECT n.eclass, n.id AS node, n.op, n.children, round(c.ms, 4) AS ms,
       list_contains(ch.nodes, n.id) AS chosen,
       len(list_filter(n.children, lambda k: NOT list_contains(ch.classes, k))) AS children_outside_graph
FROM enodes n
JOIN costs c ON c.node = n.id
CROSS JOIN chosen ch
WHERE n.eclass = (SELECT eclass FROM pick)
ORDER BY chosen DESC, c.ms, n.id;

//! The redb file (`ledger.redb`, a copy-on-write B-tree) that older releases kept the claims
//! in: read to migrate such a state dir to the journal, and by `status` before that.

use std::path::Path;

use redb::{ConcurrencyMode, Database, ReadableDatabase, ReadableTable, TableDefinition};

use super::storage;
use crate::ledger::{Claim, LedgerError};

const CLAIMS: TableDefinition<&str, &[u8]> = TableDefinition::new("claims");

pub(super) fn open_redb(path: &Path) -> Result<Database, LedgerError> {
    // SingleWriter: one writing process, and `status`, `explain` and `review --dry-run` may
    // read the file meanwhile ([`read_claims`]); a second writer is still refused.
    let db = Database::builder()
        .set_concurrency_mode(ConcurrencyMode::SingleWriter)
        .create(path)
        .map_err(|e| {
            LedgerError::Storage(format!(
                "cannot open {} (is another ip-webhook using this --state-dir?): {e}",
                path.display()
            ))
        })?;
    let txn = db.begin_write().map_err(storage("begin"))?;
    txn.open_table(CLAIMS).map_err(storage("open table"))?;
    txn.commit().map_err(storage("commit"))?;
    Ok(db)
}

/// Every claim in the file.
pub(super) fn load(db: &Database) -> Result<Vec<Claim>, LedgerError> {
    let txn = db.begin_read().map_err(storage("begin read"))?;
    let table = txn.open_table(CLAIMS).map_err(storage("open table"))?;
    let mut claims = Vec::new();
    for entry in table.iter().map_err(storage("iterate"))? {
        let (key, value) = entry.map_err(storage("read"))?;
        claims.push(decode(key.value(), value.value())?);
    }
    Ok(claims)
}

/// `claims` written to the redb file at `path` as older releases wrote them (JSON per IP):
/// the state dir a migration starts from.
#[cfg(test)]
pub(super) fn write(path: &Path, claims: &[Claim]) -> Result<(), LedgerError> {
    let db = open_redb(path)?;
    let txn = db.begin_write().map_err(storage("begin"))?;
    {
        let mut table = txn.open_table(CLAIMS).map_err(storage("open table"))?;
        for claim in claims {
            let bytes = serde_json::to_vec(claim).map_err(storage("encode"))?;
            table
                .insert(claim.ip.to_string().as_str(), bytes.as_slice())
                .map_err(storage("write"))?;
        }
    }
    txn.commit().map_err(storage("commit"))
}

/// Every claim in `state_dir/ledger.redb`, read without creating or changing anything, also
/// while a server has the file open (it writes in SingleWriter mode, which admits readers).
pub(super) fn read(state_dir: &Path) -> Result<Vec<Claim>, LedgerError> {
    let path = state_dir.join("ledger.redb");
    let db = redb::Builder::new()
        .set_concurrency_mode(ConcurrencyMode::SingleWriter)
        .open_read_only(&path)
        .map_err(|e| {
            let what = match e {
                redb::DatabaseError::DatabaseAlreadyOpen => format!(
                    "{} is held by a process that does not share it (an older ip-webhook?); stop it and retry",
                    path.display()
                ),
                redb::DatabaseError::RepairAborted => format!(
                    "{} was not closed cleanly and needs a repair, which only a writer makes: start `ip-webhook serve --state-dir {}` once",
                    path.display(),
                    state_dir.display()
                ),
                other => format!("cannot read {}: {other}", path.display()),
            };
            LedgerError::Storage(what)
        })?;
    let txn = db.begin_read().map_err(storage("begin read"))?;
    let table = match txn.open_table(CLAIMS) {
        Ok(table) => table,
        Err(redb::TableError::TableDoesNotExist(_)) => return Ok(Vec::new()),
        Err(e) => return Err(storage("open table")(e)),
    };
    let mut claims = Vec::new();
    for entry in table.iter().map_err(storage("iterate"))? {
        let (key, value) = entry.map_err(storage("read"))?;
        claims.push(decode(key.value(), value.value())?);
    }
    Ok(claims)
}

fn decode(key: &str, bytes: &[u8]) -> Result<Claim, LedgerError> {
    serde_json::from_slice(bytes).map_err(|e| LedgerError::Corrupt {
        ip: key.to_string(),
        reason: e.to_string(),
    })
}

//! The operator commands' logic, independent of the command line: `status`, `explain`,
//! `release` and `check` (the doctor).

pub mod doctor;
pub mod explain;
pub mod release;
pub mod status;

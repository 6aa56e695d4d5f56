#pragma once
// The schema's history: migration N takes a database from version N-1 to N. Append only; a shipped
// migration is never edited, since databases in the field have already run it.

#include <span>

namespace tokenfab::schema {

struct Migration {
  int version;
  const char* sql;
};

// Stored in the header (PRAGMA application_id) by migration 1, so that another program's SQLite
// file is never mistaken for ours: "TkFb".
inline constexpr int kApplicationId = 0x546b4662;

std::span<const Migration> migrations();

}  // namespace tokenfab::schema

